"""What every job used: the usage ledger and the facts machines were checked to have."""
