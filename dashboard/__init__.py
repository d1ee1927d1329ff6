"""A read-only web dashboard of one pool: nodes, tasks, groups, verdicts, the reward curve and payouts."""
