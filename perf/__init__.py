"""perf: workloads, the run harness and reports (issue 5); today the link-emulator benchmark."""
