//! AFL++ target `cluster_selector`: the body is `tensile_fuzzing::annotations::cluster_selector` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::annotations::cluster_selector(data));
}
