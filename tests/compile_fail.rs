//! Misuse that must not compile (trybuild; the expected errors are in
//! `tests/ui/*.stderr`).

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
