//! The core's imports run one way (DESIGN.md, "One way down"): no two files of `src/` import
//! each other through any chain.
//!
//! Run it alone with `cargo test --test layering`. On failure it prints every cycle, each edge
//! with the line and the path that makes it.
//!
//! The check (`support/imports.rs`) reads the sources, std only: it strips comments and literals, then takes every
//! path that starts at `crate::`, `super::` or `self::` (or at a child module of the file) —
//! in `use` trees and inline — resolves it to the file that defines the longest module prefix
//! it names, following `use` re-exports (`crate::Wheel` is `handle.rs`, not `lib.rs`), and
//! asserts the file graph has no cycle. `lib.rs` is the root: its `mod` declarations and
//! re-exports are not imports. A `mod.rs` declaring a submodule does not import it; one that
//! `use`s from it does, and a submodule's `super::X` imports the `mod.rs`. Paths inside
//! inline modules (`mod tests { use super::*; }`) resolve from that module.
//! Every file of `src/` is looked at, features' modules included.

#[path = "support/imports.rs"]
mod imports;
use imports::{Graph, read_sources};

#[test]
fn the_core_has_no_import_cycle() {
    let files = read_sources();
    let graph = Graph::build(&files);
    let cycles = graph.cycles();
    assert!(
        cycles.is_empty(),
        "the core's imports go in circles ({} cycle(s)); imports must run one way:\n\n{}",
        cycles.len(),
        cycles.join("\n")
    );
}

/// The layers, top down (DESIGN.md, "One way down"); a file may import its own layer and the
/// ones below. `error.rs` is at the bottom so that any file may name an error. A file listed
/// nowhere (a feature's server integration, say) counts as above the face.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "face",
        &[
            "src/lib.rs",
            "src/builder.rs",
            "src/handle.rs",
            "src/stats.rs",
        ],
    ),
    (
        "handles",
        &[
            "src/sleep.rs",
            "src/timeout.rs",
            "src/interval.rs",
            "src/job.rs",
            "src/keyed/",
            "src/stopped.rs",
        ],
    ),
    ("actor", &["src/actor/"]),
    ("timer state and clock", &["src/timer/"]),
    ("wheel", &["src/wheel/"]),
    ("errors", &["src/error.rs"]),
];

/// The layer of `file`: its index in [`LAYERS`] plus one, 0 if listed nowhere.
fn layer_of(file: &str) -> (usize, &'static str) {
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, files))| files.iter().any(|prefix| file.starts_with(prefix)))
        .map_or((0, "above the face"), |(index, (name, _))| {
            (index + 1, *name)
        })
}

#[test]
fn imports_run_down_the_layers() {
    let graph = Graph::build(&read_sources());
    let mut upward = Vec::new();
    for (from, targets) in &graph.edges {
        for (to, why) in targets {
            let (from_layer, from_name) = layer_of(from);
            let (to_layer, to_name) = layer_of(to);
            if to_layer < from_layer {
                upward.push(format!(
                    "    {from} ({from_name}) -> {to} ({to_name})   ({why})"
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers (face -> handles -> actor -> timer -> wheel, \
         error.rs below all):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_scan_sees_every_kind_of_import_in_the_real_sources() {
    // Guards the check above against passing vacuously (a wrong root, a parser that sees
    // nothing): each kind of path it must understand, found where the code has one.
    let files = read_sources();
    assert!(files.len() >= 20, "found only {} source files", files.len());
    let graph = Graph::build(&files);
    for (from, to) in [
        ("src/handle.rs", "src/sleep.rs"), // use crate::sleep::Sleep
        ("src/actor/mod.rs", "src/actor/inbox.rs"), // use self::inbox::Inbox
        ("src/actor/timers.rs", "src/actor/mod.rs"), // use super::{Ctx, Machine}
        ("src/wheel/mod.rs", "src/wheel/layout.rs"), // pub use layout::{..}
        ("src/wheel/tests.rs", "src/wheel/mod.rs"), // use super::*
        ("src/actor/inbox/loom_model.rs", "src/timer/state.rs"), // a test module's own file
    ] {
        assert!(
            graph
                .edges
                .get(from)
                .is_some_and(|to_set| to_set.contains_key(to)),
            "the scan missed {from} -> {to}; it saw {:#?}",
            graph.edges.get(from)
        );
    }
}

#[test]
fn a_circle_made_of_each_kind_of_path_is_caught() {
    let files = [
        ("src/lib.rs", "mod a; mod b; pub mod c; pub use c::Deep;"),
        (
            "src/a.rs",
            "// crate::b::Ignored in a comment\n\
             const S: &str = \"crate::b::Ignored\"; const C: char = '\"';\n\
             pub(crate) fn f<'x>(_: &'x ()) { crate::b::g(); }",
        ),
        ("src/b.rs", "use crate::{Deep as D, c::inner::{self}};"),
        ("src/c/mod.rs", "pub mod inner; pub use inner::Deep;"),
        (
            "src/c/inner.rs",
            "pub struct Deep;\n#[cfg(test)] mod tests { use super::*; }\nuse super::super::a;",
        ),
    ];
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(path, source)| (path.to_string(), source.to_string()))
        .collect();
    let graph = Graph::build(&files);
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:#?}");
    for file in ["src/a.rs", "src/b.rs", "src/c/inner.rs"] {
        assert!(
            cycles[0].contains(file),
            "{file} missing from {}",
            cycles[0]
        );
    }
    // Not in the circle: the re-exporting mod.rs (b reaches `Deep` through it) and the root.
    assert!(!cycles[0].contains("src/c/mod.rs"), "{}", cycles[0]);
    assert!(!cycles[0].contains("src/lib.rs"), "{}", cycles[0]);
}
