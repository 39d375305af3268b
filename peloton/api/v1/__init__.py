"""Generated protobuf and gRPC code (do not edit; `make proto` regenerates)."""
