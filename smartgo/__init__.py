"""SmartGo: a RocketMQ 4.x wire- and store-compatible message broker built from actors."""

__version__ = "0.1.0"
