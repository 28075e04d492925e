"""c2dtn: DTN overlay for MQTT/CoAP C2 traffic over disrupted tactical links.

This package holds what every component shares: the root CLI and the error types.
"""

__version__ = "0.1.0"
