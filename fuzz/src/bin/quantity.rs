//! AFL++ target `quantity`: the body is `tensile_fuzzing::quantity::quantity` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::quantity::quantity(data));
}
