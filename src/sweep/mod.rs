//! Sweeps: many training runs from one spec, run by local workers or as a Slurm job array.

pub mod slurm;
