// The integration tests run the two binaries of this workspace, which live in their own
// packages (crates/coherent-mount, crates/coherent-cli), so cargo sets no CARGO_BIN_EXE_*
// for them here. Tell the tests where this build's binaries are: the profile directory is
// three levels above OUT_DIR (<target>/<profile>/build/coherent-<hash>/out), whatever
// CARGO_TARGET_DIR or the profile is. `cargo test` and scripts/test.sh build them.
fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let dir = std::path::Path::new(&out)
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is <target>/<profile>/build/<pkg>/out");
    println!("cargo:rustc-env=COHERENT_BIN_DIR={}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
}
