"""One scheduler replica: its assembly (`assembly.Scheduler`, the shell around the pure step that
builds and starts the components), its health document and dependency probes, the backends it
opens (and whether they take clients that prove nothing), the heap guard and the event-loop
stall watchdog."""
