"""What drives the emulator: the demo's scenario, its load, what a run observes and its report; serve."""
