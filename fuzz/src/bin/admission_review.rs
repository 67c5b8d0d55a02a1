//! AFL++ target `admission_review`: the body is `tensile_fuzzing::admission::review` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::admission::review(data));
}
