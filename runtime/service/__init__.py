"""What the gateway calls: thread commands for a principal, permissions and history rewrites."""
