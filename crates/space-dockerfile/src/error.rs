//! Error types. Parse errors carry the 1-based line so `space template build` can point the
//! user at the offending instruction rather than at "somewhere in the Dockerfile".

/// Why a Dockerfile was refused, and the line where the offending instruction starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line of the instruction (or directive) at fault.
    pub line: usize,
    /// What is wrong, phrased for the person who wrote the Dockerfile.
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(line: usize, message: impl Into<String>) -> Self {
        Self { line, message: message.into() }
    }
}

/// Why a word could not be expanded by [`crate::substitute`]. Each variant carries the whole
/// word, because the builder reports it next to the instruction's line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstituteError {
    /// A `${` without its closing `}`.
    #[error("unterminated ${{ in {word:?}")]
    Unterminated { word: String },
    /// `${}` or a `${` followed by something that is not a variable name.
    #[error("bad variable name after ${{ in {word:?}")]
    BadName { word: String },
    /// `${NAME?err}`, `${NAME#pat}` and friends, which this subset leaves out.
    #[error(
        "unsupported modifier {modifier:?} in {word:?} (supported: ${{NAME:-default}}, ${{NAME-default}}, \
         ${{NAME:+alt}}, ${{NAME+alt}})"
    )]
    UnsupportedModifier { word: String, modifier: char },
    /// The expansion grew past [`crate::MAX_EXPANDED`] bytes.
    #[error("{word:?}… expands to more than 256 KiB")]
    TooLong { word: String },
}
