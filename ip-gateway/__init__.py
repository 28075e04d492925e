"""ip_gateway: TPROXY interception and the MQTT/CoAP split-session proxies.
Built under issue 4; nothing here yet."""
