"""Model providers behind one interface (`base.Model`); agents import them from `runtime`."""
