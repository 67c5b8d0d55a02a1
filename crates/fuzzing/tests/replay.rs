#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every input of every fuzz target's corpus (`fuzz/corpus/<target>/`) and of its regressions
//! (`fuzz/regressions/<target>/`: inputs that once crashed, hung or blew up memory, kept after
//! the fix) runs through the target's body, as the fuzzer ran it. No fuzzing here: the
//! corpora only. A target whose folder is missing or empty fails: a replay of nothing would
//! pass for ever.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e} (every fuzz target has one)", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().is_none_or(|n| n != "README.md"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no input", dir.display());
    files
}

fn replay(kind: &str, name: &str) {
    let target = tensile_fuzzing::target(name).unwrap();
    let dir = fuzz_dir().join(kind).join(name);
    for file in inputs(&dir) {
        let data = std::fs::read(&file).unwrap();
        let result = std::panic::catch_unwind(|| (target.run)(&data));
        assert!(
            result.is_ok(),
            "{name}: {} fails (see the panic above)",
            file.display()
        );
    }
}

macro_rules! replays {
    ($($target:ident),* $(,)?) => {
        mod corpus {
            $(#[test] fn $target() { super::replay("corpus", stringify!($target)); })*
        }
        mod regressions {
            $(#[test] fn $target() { super::replay("regressions", stringify!($target)); })*
        }
        #[test]
        fn every_target_is_replayed() {
            let listed = [$(stringify!($target)),*];
            let targets: Vec<&str> = tensile_fuzzing::TARGETS.iter().map(|t| t.name).collect();
            assert_eq!(listed.to_vec(), targets);
        }
    };
}

replays!(
    spdy_frames,
    spdy_header_block,
    spdy_streams,
    websocket_frames,
    websocket_streams,
    resize,
    kubelet_router,
    admission_review,
    extender_args,
    cluster_selector,
    annotations,
    quantity,
);
