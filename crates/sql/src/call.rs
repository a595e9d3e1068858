//! `CALL procedure(arg, ...)`: TimesTen's built-in procedures.
//!
//! The arguments of the procedures hawser runs are literals only, so the statement is
//! read here rather than by sqlparser (whose GenericDialect does not take TimesTen's
//! `0x01` binary literals): `NULL`, integers (`45`, `-1`, `0x01`), `'text'` and
//! `X'01'` binary. Which procedures exist and what they do is the session's and the
//! node's business ([`crate::Session`], [`crate::ReplicationHooks::call`]).

use hawser_core::Value;

/// A parsed `CALL`.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The procedure name, folded to lower case (`ttrepsyncset`).
    pub name: String,
    /// The procedure name as written, for messages.
    pub written: String,
    pub args: Vec<Value>,
}

impl Call {
    /// Argument `i` (0-based); a missing argument is NULL, as TimesTen treats omitted
    /// optional parameters.
    pub fn arg(&self, i: usize) -> &Value {
        self.args.get(i).unwrap_or(&Value::Null)
    }
}

/// Parses `CALL name [( [arg [, arg]*] )]` (without the final `;`).
pub fn parse_call(text: &str) -> Result<Call, String> {
    let mut p = Cursor { s: text, i: 0 };
    p.skip_ws();
    let kw = p.word();
    if !kw.eq_ignore_ascii_case("call") {
        return Err("expected CALL".into());
    }
    p.skip_ws();
    let written = p.word().to_string();
    if written.is_empty() {
        return Err("CALL needs a procedure name".into());
    }
    p.skip_ws();
    let mut args = Vec::new();
    if p.eat('(') {
        p.skip_ws();
        if !p.eat(')') {
            loop {
                p.skip_ws();
                args.push(p.literal()?);
                p.skip_ws();
                if p.eat(')') {
                    break;
                }
                if !p.eat(',') {
                    return Err(format!(
                        "expected , or ) after argument {} of {written}, found {}",
                        args.len(),
                        p.rest_start()
                    ));
                }
            }
        }
    }
    p.skip_ws();
    if !p.rest().is_empty() {
        return Err(format!(
            "unexpected {} after the arguments of {written}",
            p.rest_start()
        ));
    }
    Ok(Call {
        name: written.to_ascii_lowercase(),
        written,
        args,
    })
}

struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    /// The start of what is left, for messages.
    fn rest_start(&self) -> String {
        match self.rest().chars().take(12).collect::<String>() {
            s if s.is_empty() => "the end of the statement".into(),
            s => format!("'{s}'"),
        }
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.i += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        if self.rest().starts_with(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }

    /// An identifier (letters, digits, `_`, `$`, `.`), possibly empty.
    fn word(&mut self) -> &'a str {
        let rest = self.rest();
        let n = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.'))
            .unwrap_or(rest.len());
        self.i += n;
        &rest[..n]
    }

    fn literal(&mut self) -> Result<Value, String> {
        let rest = self.rest();
        if rest.starts_with('\'') {
            return self.quoted().map(Value::Text);
        }
        if (rest.starts_with("X'") || rest.starts_with("x'")) && rest.len() > 1 {
            self.i += 1;
            let hex = self.quoted()?;
            return decode_hex(&hex).map(Value::Bytes);
        }
        let negative = self.eat('-');
        let word = self.word();
        if word.eq_ignore_ascii_case("null") && !negative {
            return Ok(Value::Null);
        }
        let parsed = match word.get(..2) {
            Some("0x") | Some("0X") => i64::from_str_radix(&word[2..], 16).ok(),
            _ => word.parse::<i64>().ok(),
        };
        match parsed {
            Some(v) if negative => Ok(Value::Int(-v)),
            Some(v) => Ok(Value::Int(v)),
            None if word.is_empty() => {
                Err(format!("expected an argument, found {}", self.rest_start()))
            }
            None => Err(format!(
                "argument '{}{word}' is not NULL, an integer, 'text' or X'hex'",
                if negative { "-" } else { "" }
            )),
        }
    }

    /// A single-quoted string (`''` is a quote), the cursor on its opening quote.
    fn quoted(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let rest = self.rest();
            let Some(q) = rest.find('\'') else {
                return Err("unterminated quoted string".into());
            };
            out.push_str(&rest[..q]);
            self.i += q + 1;
            if self.rest().starts_with('\'') {
                out.push('\'');
                self.i += 1;
            } else {
                return Ok(out);
            }
        }
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("X'{s}' has an odd number of hex digits"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("X'{s}' is not hex")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timesten_forms_parse() {
        let c = parse_call("CALL ttRepSyncSet(0x01, 45, NULL)").unwrap();
        assert_eq!(c.name, "ttrepsyncset");
        assert_eq!(c.written, "ttRepSyncSet");
        assert_eq!(c.args, vec![Value::Int(1), Value::Int(45), Value::Null]);
        let c = parse_call("call ttRepSyncGet()").unwrap();
        assert!(c.args.is_empty());
        let c = parse_call("call ttRepSyncGet").unwrap();
        assert!(c.args.is_empty());
        let c = parse_call("CALL ttRepSubscriberWait('r1', NULL, 'ds2', 'h''x', -1)").unwrap();
        assert_eq!(
            c.args,
            vec![
                Value::Text("r1".into()),
                Value::Null,
                Value::Text("ds2".into()),
                Value::Text("h'x".into()),
                Value::Int(-1)
            ]
        );
        let c = parse_call("CALL ttRepXactStatus(X'0a01')").unwrap();
        assert_eq!(c.args, vec![Value::Bytes(vec![10, 1])]);
        assert_eq!(c.arg(3), &Value::Null);
    }

    #[test]
    fn bad_calls_say_what_is_wrong() {
        for (text, needle) in [
            ("CALL", "procedure name"),
            ("CALL p(1 2)", "expected , or )"),
            ("CALL p(1, )", "expected an argument"),
            ("CALL p(abc)", "'abc' is not NULL"),
            ("CALL p('x)", "unterminated"),
            ("CALL p(X'0')", "odd number"),
            ("CALL p(1) extra", "unexpected 'extra'"),
        ] {
            let e = parse_call(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
