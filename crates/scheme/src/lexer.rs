//! Tokens of the replication-scheme language.
//!
//! The lexer knows no keywords: every bare word is a [`TokenKind::Word`] and the parser
//! decides by position whether `subscriber` is the keyword or a database called
//! `subscriber` (TimesTen's own examples use both). It skips whitespace, `--` line
//! comments and `/* */` block comments, and records every token's byte span so that
//! diagnostics can point at it.
//!
//! Bad input never stops the lexer: an unexpected character or an unterminated string is
//! reported and skipped, so the checker can list every problem of a file at once.

use crate::error::{ErrorCode, SchemeError};
use crate::span::Span;

/// What a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenKind {
    /// A bare word as written (identifier or keyword; the parser folds case).
    Word(String),
    /// A `"double-quoted"` identifier or host, `""` unescaped.
    Quoted(String),
    /// A `'single-quoted'` string, `''` unescaped.
    Str(String),
    /// An unsigned integer literal.
    Int(u64),
    Dot,
    Comma,
    Semicolon,
    LParen,
    RParen,
    Star,
}

/// One token and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    pub span: Span,
}

impl TokenKind {
    /// How the token reads in a "found ..." message.
    pub fn describe(&self) -> String {
        match self {
            TokenKind::Word(w) => format!("`{w}`"),
            TokenKind::Quoted(q) => format!("\"{q}\""),
            TokenKind::Str(s) => format!("'{s}'"),
            TokenKind::Int(n) => format!("`{n}`"),
            TokenKind::Dot => "`.`".into(),
            TokenKind::Comma => "`,`".into(),
            TokenKind::Semicolon => "`;`".into(),
            TokenKind::LParen => "`(`".into(),
            TokenKind::RParen => "`)`".into(),
            TokenKind::Star => "`*`".into(),
        }
    }
}

/// Splits `source` into tokens. Lexical problems are returned beside the tokens; the
/// offending characters are left out of the token list.
pub fn tokenize(source: &str) -> (Vec<Token>, Vec<SchemeError>) {
    let mut lexer = Lexer {
        src: source,
        bytes: source.as_bytes(),
        pos: 0,
        tokens: Vec::new(),
        errors: Vec::new(),
    };
    lexer.run();
    (lexer.tokens, lexer.errors)
}

struct Lexer<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    tokens: Vec<Token>,
    errors: Vec<SchemeError>,
}

fn is_word_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '$' | '#')
}

impl Lexer<'_> {
    fn peek_char(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn push(&mut self, kind: TokenKind, start: usize) {
        self.tokens.push(Token {
            kind,
            span: Span::new(start, self.pos),
        });
    }

    fn error(&mut self, start: usize, message: impl Into<String>) {
        self.errors.push(SchemeError::new(
            ErrorCode::Lex,
            Span::new(
                start,
                self.pos.max(start + 1).min(self.src.len().max(start)),
            ),
            message,
        ));
    }

    fn run(&mut self) {
        while let Some(c) = self.peek_char() {
            let start = self.pos;
            match c {
                c if c.is_whitespace() => self.pos += c.len_utf8(),
                '-' if self.bytes.get(self.pos + 1) == Some(&b'-') => {
                    while let Some(c) = self.peek_char() {
                        if c == '\n' {
                            break;
                        }
                        self.pos += c.len_utf8();
                    }
                }
                '/' if self.bytes.get(self.pos + 1) == Some(&b'*') => {
                    match self.src[self.pos + 2..].find("*/") {
                        Some(end) => self.pos += 2 + end + 2,
                        None => {
                            self.pos = self.src.len();
                            self.error(start, "unterminated /* comment");
                        }
                    }
                }
                '"' | '\'' => self.quoted(c),
                c if c.is_ascii_digit() => {
                    while self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                        self.pos += 1;
                    }
                    // A number glued to letters (`1abc`) is one bad word, not two tokens.
                    if self.peek_char().is_some_and(is_word_char) {
                        while let Some(c) = self.peek_char().filter(|&c| is_word_char(c)) {
                            self.pos += c.len_utf8();
                        }
                        let text = self.src[start..self.pos].to_string();
                        self.push(TokenKind::Word(text), start);
                        continue;
                    }
                    match self.src[start..self.pos].parse::<u64>() {
                        Ok(n) => self.push(TokenKind::Int(n), start),
                        Err(_) => self.error(start, "number too large"),
                    }
                }
                c if is_word_start(c) => {
                    while let Some(c) = self.peek_char().filter(|&c| is_word_char(c)) {
                        self.pos += c.len_utf8();
                    }
                    let text = self.src[start..self.pos].to_string();
                    self.push(TokenKind::Word(text), start);
                }
                _ => {
                    self.pos += c.len_utf8();
                    let kind = match c {
                        '.' => TokenKind::Dot,
                        ',' => TokenKind::Comma,
                        ';' => TokenKind::Semicolon,
                        '(' => TokenKind::LParen,
                        ')' => TokenKind::RParen,
                        '*' => TokenKind::Star,
                        other => {
                            self.error(start, format!("unexpected character {other:?}"));
                            continue;
                        }
                    };
                    self.push(kind, start);
                }
            }
        }
    }

    /// A `"..."` or `'...'` literal; the quote doubled inside stands for itself.
    fn quoted(&mut self, quote: char) {
        let start = self.pos;
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek_char() {
                None => {
                    let what = if quote == '"' {
                        "quoted name"
                    } else {
                        "string"
                    };
                    self.error(start, format!("unterminated {what}"));
                    return;
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    if self.peek_char() == Some(quote) {
                        self.pos += 1;
                        text.push(quote);
                    } else {
                        break;
                    }
                }
                Some(c) => {
                    self.pos += c.len_utf8();
                    text.push(c);
                }
            }
        }
        if quote == '"' {
            if text.is_empty() {
                self.error(start, "empty quoted name");
                return;
            }
            self.push(TokenKind::Quoted(text), start);
        } else {
            self.push(TokenKind::Str(text), start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<TokenKind> {
        let (tokens, errors) = tokenize(s);
        assert!(errors.is_empty(), "{errors:?}");
        tokens.into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn skips_comments_and_keeps_quotes() {
        use TokenKind::*;
        assert_eq!(
            kinds("a -- x\n /* y \n z */ \"B\"\"c\" 'it''s' 10.0.0.1;"),
            vec![
                Word("a".into()),
                Quoted("B\"c".into()),
                Str("it's".into()),
                Int(10),
                Dot,
                Int(0),
                Dot,
                Int(0),
                Dot,
                Int(1),
                Semicolon
            ]
        );
    }

    #[test]
    fn reports_bad_characters_and_carries_on() {
        let (tokens, errors) = tokenize("a @ b 'open");
        assert_eq!(tokens.len(), 2);
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].span.start, 2);
        assert_eq!(errors[1].code, ErrorCode::Lex);
    }
}
