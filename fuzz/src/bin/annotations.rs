//! AFL++ target `annotations`: the body is `tensile_fuzzing::annotations::others` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::annotations::others(data));
}
