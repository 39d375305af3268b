"""Plain domain types shared by every component. No grpc, no SQL, no clock here."""
