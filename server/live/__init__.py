"""Per-gateway live services: the action inbox, presence, token revocation and quotas."""
