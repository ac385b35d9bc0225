"""How runs execute: the one Driver and the Scheduler protocol it runs, the run pool of Ray tasks,
the task body, Ray connection and stop signals, Ray jobs and the trainer backends."""
