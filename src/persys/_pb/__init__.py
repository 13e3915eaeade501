"""Generated protobuf and gRPC modules (built from proto/ by setup.py; not committed)."""
