"""MQTT 3.1.1 and 5.0: the device front door of a broker node."""
