//! The legend labels of `qcandle compare`'s curves.
//!
//! A run's curves are labelled by its config (`bf16`, `posit<16,1>`) when that names it among
//! the runs compared. Runs that share a config (seeds, training-set sizes, learning rates of
//! one format) would get equal labels that the legend cannot tell apart, so then every curve
//! is labelled by its run directory's name instead, as the table's `run` column is.

use std::collections::HashSet;

/// One label per run: the configs when they are pairwise distinct, else the directory names.
pub fn curve_labels(configs: &[String], dir_names: &[String]) -> Vec<String> {
    let distinct: HashSet<&String> = configs.iter().collect();
    if distinct.len() == configs.len() {
        configs.to_vec()
    } else {
        dir_names.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::curve_labels;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn distinct_configs_label_the_curves() {
        let labels = curve_labels(
            &strings(&["float32", "bf16", "posit<8,0>"]),
            &strings(&["a", "b", "c"]),
        );
        assert_eq!(labels, strings(&["float32", "bf16", "posit<8,0>"]));
    }

    #[test]
    fn a_shared_config_makes_every_curve_use_its_directory() {
        let labels = curve_labels(
            &strings(&["float32", "bf16", "float32"]),
            &strings(&["f32-500", "bf16-500", "f32-1000"]),
        );
        assert_eq!(labels, strings(&["f32-500", "bf16-500", "f32-1000"]));
    }

    #[test]
    fn one_run_keeps_its_config() {
        assert_eq!(
            curve_labels(&strings(&["fp8"]), &strings(&["run"])),
            strings(&["fp8"])
        );
    }
}
