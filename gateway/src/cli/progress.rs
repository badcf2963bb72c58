//! The load progress bar (drawn on stderr only when it is a terminal).
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar for loading `label`, fed with fractions in `[0, 1]`.
pub fn load_bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {percent:>3}% {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("loading {label}"));
    bar
}
