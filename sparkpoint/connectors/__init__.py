from sparkpoint.connectors.delta_sink import DeltaSink

__all__ = ["DeltaSink"]
