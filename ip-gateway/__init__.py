"""ip_gateway: TPROXY interception and the MQTT/CoAP split-session proxies."""
