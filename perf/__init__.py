"""perf: workloads, the run harness and reports (`c2dtn perf`; docs/perf/)."""
