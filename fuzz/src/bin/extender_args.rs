//! AFL++ target `extender_args`: the body is `tensile_fuzzing::extender::calls` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::extender::calls(data));
}
