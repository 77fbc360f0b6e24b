"""The Intel Gaudi probe: hl-smi and NIC-port sysfs snapshots (live, replayed or recorded) mapped onto the shared catalog."""
