"""batchspec: offline batch generation over Parquet with per-shard calibrated speculative decoding."""

__version__ = "0.1.0"
