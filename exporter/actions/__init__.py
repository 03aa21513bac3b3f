"""Acting on the cluster from the health verdict, opt-in: the Slurm action mode (--action.slurm)."""
