"""Who is on each GPU: Kubernetes pods, Slurm jobs, processes. Read on their own schedules, matched to
devices by one pure function (model.resolve), turned into labels by the enrich stage."""
