"""Code the agent ships for user programs in script mode (``tpuops_helper``); see ``script``."""
