"""Planted faults: small faulty schedulers behind the tenantry adapter protocol (registry below)."""
