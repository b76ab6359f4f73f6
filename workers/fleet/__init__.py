"""The live fleet: each device worker's heartbeat, the device table built from them, and the device
leases of multi-device jobs.
"""
