//! No crate of the workspace has modules that use each other in a cycle,
//! except the ones listed here while they are being untangled.

use std::collections::BTreeSet;
use std::path::Path;

use trireme_module_cycles::crate_cycles;

/// Cycles known today, by crate directory and modules. Each entry must
/// still be there exactly: when one is untangled (or changes), this test
/// fails until the entry is removed (or updated), so it cannot hide a new
/// cycle among the same modules later.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

#[test]
fn no_module_cycles_but_the_known_ones() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<_> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("Cargo.toml").exists() && dir.join("src").is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 10, "found only {dirs:?} under {crates:?}");
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        for cycle in crate_cycles(&dir.join("src")).unwrap() {
            let known = KNOWN_CYCLES
                .iter()
                .any(|(in_crate, modules)| *in_crate == name && cycle.modules == *modules);
            if known {
                seen.insert((name.clone(), cycle.modules.clone()));
            } else {
                problems.push(format!("crates/{name}: {cycle}"));
            }
        }
    }
    for (in_crate, modules) in KNOWN_CYCLES {
        let modules: Vec<String> = modules.iter().map(|m| m.to_string()).collect();
        if !seen.contains(&(in_crate.to_string(), modules.clone())) {
            problems.push(format!(
                "crates/{in_crate}: the known cycle of modules {} is gone or changed: remove (or update) its entry in KNOWN_CYCLES ({})",
                modules.join(", "),
                file!()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "module cycles (a module's files may use each other; sibling modules may not):\n{}",
        problems.join("\n")
    );
}
