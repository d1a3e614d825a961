//! A fixture tree of files and links under the temporary directory, for tests of code that reads /sys and /proc.

use std::fs;
use std::path::PathBuf;

/// A folder of fixture files, removed when dropped.
pub struct Fixture(pub PathBuf);

impl Fixture {
    /// A fresh folder named after the test.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bc-agent-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the fixture directory");
        Fixture(dir)
    }

    /// Writes a file (and its parent folders).
    pub fn file(&self, relative: &str, text: &str) {
        let path = self.0.join(relative);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create directories");
        fs::write(path, text).expect("write a fixture file");
    }

    /// Creates a folder.
    pub fn dir(&self, relative: &str) {
        fs::create_dir_all(self.0.join(relative)).expect("create a fixture directory");
    }

    /// Creates a symbolic link to `target`.
    pub fn link(&self, relative: &str, target: &str) {
        let path = self.0.join(relative);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create directories");
        std::os::unix::fs::symlink(target, path).expect("create a fixture link");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
