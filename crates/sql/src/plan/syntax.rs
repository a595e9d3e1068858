//! AST nodes read without a scope: function call names and arguments, operators,
//! literals and typed strings, and the error for an expression kind not supported.

use hawser_core::coerce::coerce;
use hawser_core::Value;
use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use super::{unsupported, AggFunc};
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr::{self, BinOp, Expr, Func, UnaryOp};
use crate::limits::MAX_EXPR_DEPTH;
use crate::types::map_type;

/// A function call's name and arguments, read before any argument is bound.
pub(super) struct CallParts<'e> {
    /// Folded to lower case.
    pub(super) name: String,
    pub(super) args: Vec<&'e ast::FunctionArg>,
    pub(super) distinct: bool,
}

pub(super) fn call_parts(f: &ast::Function) -> Result<CallParts<'_>> {
    let name = match f.name.0.as_slice() {
        [ast::ObjectNamePart::Identifier(id)] => id.value.to_ascii_lowercase(),
        _ => return unsupported(format!("function {} is not supported", f.name)),
    };
    if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
        return unsupported("window functions, FILTER and WITHIN GROUP are not supported");
    }
    let (args, distinct) = match &f.args {
        ast::FunctionArguments::None => (Vec::new(), false),
        ast::FunctionArguments::List(list) => (
            list.args.iter().collect(),
            matches!(
                list.duplicate_treatment,
                Some(ast::DuplicateTreatment::Distinct)
            ),
        ),
        ast::FunctionArguments::Subquery(_) => return unsupported("subqueries are not supported"),
    };
    Ok(CallParts {
        name,
        args,
        distinct,
    })
}

pub(super) fn aggregate_func(name: &str) -> Option<AggFunc> {
    Some(match name {
        "count" => AggFunc::Count,
        "sum" => AggFunc::Sum,
        "min" => AggFunc::Min,
        "max" => AggFunc::Max,
        "avg" => AggFunc::Avg,
        _ => return None,
    })
}

pub(super) fn scalar_func(name: &str) -> Result<Func> {
    match Func::by_name(name) {
        Some(func) => Ok(func),
        None => unsupported(format!("function {} is not supported", name.to_uppercase())),
    }
}

pub(super) fn scalar_arg<'e>(a: &'e ast::FunctionArg, name: &str) -> Result<&'e ast::Expr> {
    match a {
        ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
        _ => unsupported(format!("arguments of {name} must be expressions")),
    }
}

pub(super) fn check_arity(func: Func, name: &str, n: usize) -> Result<()> {
    let ok = match func {
        Func::Coalesce => n > 0,
        _ => n == 1,
    };
    if ok {
        return Ok(());
    }
    Err(ErrorKind::InvalidStatement(format!(
        "wrong number of arguments for {}",
        name.to_uppercase()
    ))
    .into())
}

pub(super) fn unary_op(op: &ast::UnaryOperator) -> Result<UnaryOp> {
    match op {
        ast::UnaryOperator::Not => Ok(UnaryOp::Not),
        ast::UnaryOperator::Minus => Ok(UnaryOp::Minus),
        ast::UnaryOperator::Plus => Ok(UnaryOp::Plus),
        other => unsupported(format!("operator {other} is not supported")),
    }
}

/// `-9223372036854775808` must read as one literal, not overflow on negation.
pub(super) fn negative_literal(
    e: &ast::Expr,
    op: UnaryOp,
    operand: &ast::Expr,
) -> Option<Result<Expr>> {
    let (UnaryOp::Minus, ast::Expr::Value(v)) = (op, operand) else {
        return None;
    };
    let ast::Value::Number(n, _) = &v.value else {
        return None;
    };
    Some(
        expr::parse_number(&format!("-{n}"))
            .at(e.span().start)
            .map(Expr::Literal),
    )
}

pub(super) fn binary_op(op: &ast::BinaryOperator) -> Result<BinOp> {
    use ast::BinaryOperator as B;
    Ok(match op {
        B::Plus => BinOp::Add,
        B::Minus => BinOp::Sub,
        B::Multiply => BinOp::Mul,
        B::Divide => BinOp::Div,
        B::Modulo => BinOp::Mod,
        B::StringConcat => BinOp::Concat,
        B::Eq => BinOp::Eq,
        B::NotEq => BinOp::NotEq,
        B::Lt => BinOp::Lt,
        B::LtEq => BinOp::LtEq,
        B::Gt => BinOp::Gt,
        B::GtEq => BinOp::GtEq,
        B::And => BinOp::And,
        B::Or => BinOp::Or,
        other => return unsupported(format!("operator {other} is not supported")),
    })
}

/// `DATE '2026-01-02'` and the like: the text read as the type at plan time.
pub(super) fn typed_string(e: &ast::Expr, ts: &ast::TypedString) -> Result<Expr> {
    let at = e.span().start;
    let ty = map_type(&ts.data_type).at(at)?;
    let text = match &ts.value.value {
        ast::Value::SingleQuotedString(s) => s.clone(),
        other => other.to_string(),
    };
    Ok(Expr::Literal(coerce(Value::Text(text), &ty).at(at)?))
}

/// An expression kind hawser does not evaluate.
pub(super) fn unsupported_expr(e: &ast::Expr) -> Result<Expr> {
    let text = e.to_string();
    let err = Error::from(ErrorKind::Unsupported(format!(
        "expression {} is not supported",
        shortened(&text)
    )));
    // Every level prints at least one character, so a short text is a shallow
    // expression, whose span is safe to take (see [`Binder`]).
    Err(if text.len() <= MAX_EXPR_DEPTH {
        err.or_at(e.span().start)
    } else {
        err
    })
}

/// `text` cut to a length fit for a message.
fn shortened(text: &str) -> String {
    const SHOWN: usize = 80;
    match text.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{} ...", &text[..i]),
        None => text.to_string(),
    }
}

/// Where the operator of `left op right` stands: just after the left operand.
pub(super) fn op_location(left: &ast::Expr, _right: &ast::Expr) -> Option<Location> {
    let end = left.span().end;
    (end.line > 0).then_some(end)
}

/// The value of a literal.
pub(super) fn literal(v: &ast::Value) -> Result<Value> {
    use ast::Value as V;
    match v {
        V::Number(n, _) => expr::parse_number(n),
        V::SingleQuotedString(s)
        | V::NationalStringLiteral(s)
        | V::EscapedStringLiteral(s)
        | V::TripleSingleQuotedString(s) => Ok(Value::Text(s.clone())),
        V::HexStringLiteral(h) => hex(h).map(Value::Bytes),
        V::Boolean(b) => Ok(Value::Bool(*b)),
        V::Null => Ok(Value::Null),
        V::DoubleQuotedString(s) => Err(ErrorKind::UndefinedColumn(format!(
            "column \"{s}\" does not exist (strings take single quotes)"
        ))
        .into()),
        other => unsupported(format!("literal {other} is not supported")),
    }
}

fn hex(h: &str) -> Result<Vec<u8>> {
    let bad = || ErrorKind::InvalidText(format!("invalid hexadecimal literal X'{h}'"));
    if !h.len().is_multiple_of(2) {
        return Err(bad().into());
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            h.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| bad().into())
        })
        .collect()
}
