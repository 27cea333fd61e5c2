//! Lists every file in `migrations/` for `src/migrate.rs`, in name order,
//! so a migration added there is always applied.

use std::fmt::Write;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    // Read when the script runs, and named in the generated code relative
    // to the package as the library sees it: the same target directory
    // may build the package from another checkout.
    let dir =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("migrations/ exists")
        .map(|entry| entry.expect("readable migrations/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for path in files {
        let name = path.file_stem().and_then(|s| s.to_str()).expect("UTF-8 migration name");
        let file = format!("/migrations/{name}.json");
        writeln!(out, "    ({name:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), {file:?}))),").expect("write");
    }
    out.push(']');
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("migrations.rs");
    std::fs::write(dest, out).expect("write migrations.rs");
}
