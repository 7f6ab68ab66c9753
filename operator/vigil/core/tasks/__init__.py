"""Task arrays (spec.tasks): index ranges (`ranges`) and the array's decision (`array`), which
projects each active task onto the single-job lifecycle (`vigil.core.lifecycle`)."""
