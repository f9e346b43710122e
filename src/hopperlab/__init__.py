"""hopperlab: experiments on Hopper-class GPU clusters, orchestrated by Snakemake and Slurm."""

__version__ = "0.1.0"
