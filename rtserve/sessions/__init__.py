"""The transport-agnostic session core: manager, runners, bounded output buffers, resume."""
