"""What a rank and the launcher's telemetry server say to each other: the messages, their
framing and checks, the environment contract, the duration histogram's buckets. The only
telemetry code both sides import.
"""
