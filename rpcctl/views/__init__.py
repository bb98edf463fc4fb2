"""What is drawn from the SDK: the live view's panels, and a run as Chrome trace-event JSON."""
