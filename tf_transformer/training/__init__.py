"""Section 5: the loss, the schedule, the distributed trainer and its checkpoints."""
