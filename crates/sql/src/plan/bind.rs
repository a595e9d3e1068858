//! The binder: sqlparser expressions bound to [`Expr`] over the row of the table in
//! scope, with aggregates collected and the expression depth limited.

use std::cell::Cell;

use hawser_core::coerce::coerce;
use hawser_core::{DataType, Ident, QualName, Value};
use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use super::scope::TableScope;
use super::select::AGG_BASE;
use super::syntax::{
    aggregate_func, binary_op, call_parts, check_arity, literal, negative_literal, op_location,
    scalar_arg, scalar_func, typed_string, unary_op, unsupported_expr, CallParts,
};
use super::{ident, qual_name, unsupported, AggCall, AggFunc};
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr::{BinOp, Expr, SeqOp};
use crate::limits::{self, MAX_EXPR_DEPTH};
use crate::types::map_type;

/// Binds AST expressions to [`Expr`] within a scope.
///
/// Binding is where [`MAX_EXPR_DEPTH`] is enforced, so it must not itself recurse
/// through a parsed expression deeper than that: it descends one level at a time and
/// asks sqlparser for a node's span (which recurses through the whole node) only once
/// the node is bound, or when the node is a leaf.
pub(super) struct Binder<'a> {
    pub(super) scope: Option<TableScope<'a>>,
    /// How many levels deep the expression being bound is at this point.
    depth: Cell<usize>,
}

/// One level of [`Binder::depth`], given back when dropped.
struct Level<'b>(&'b Cell<usize>);

impl Drop for Level<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl<'a> Binder<'a> {
    pub(super) fn new(scope: Option<TableScope<'a>>) -> Self {
        Binder {
            scope,
            depth: Cell::new(0),
        }
    }

    /// Enters one more level of the expression being bound.
    fn descend(&self) -> Result<Level<'_>> {
        let depth = self.depth.get() + 1;
        if depth > MAX_EXPR_DEPTH {
            return Err(limits::too_deep().into());
        }
        self.depth.set(depth);
        Ok(Level(&self.depth))
    }

    fn column_type(&self, i: usize) -> Option<DataType> {
        self.scope
            .as_ref()
            .and_then(|s| s.table.columns.get(i))
            .map(|c| c.data_type)
    }

    /// The column an UPDATE's SET names.
    pub(super) fn column_of_name(&self, name: &ast::ObjectName) -> Result<usize> {
        let qn = qual_name(name)?;
        let Some(scope) = &self.scope else {
            return Err(ErrorKind::UndefinedColumn(format!("column {qn} does not exist")).into());
        };
        scope.table.column_index(&qn.name).ok_or_else(|| {
            Error::from(ErrorKind::UndefinedColumn(format!(
                "column {} of table {} does not exist",
                qn.name, scope.table.name
            )))
            .or_at(name.span().start)
        })
    }

    /// Binds an expression where aggregates are not allowed.
    pub(super) fn bind(&self, e: &ast::Expr) -> Result<Expr> {
        self.bind_in(e, None)
    }

    /// Binds an expression where aggregates are allowed, collecting them in `calls`.
    pub(super) fn bind_agg(&self, e: &ast::Expr, calls: &mut Vec<AggCall>) -> Result<Expr> {
        self.bind_in(e, Some(calls))
    }

    fn bind_in(&self, e: &ast::Expr, calls: Option<&mut Vec<AggCall>>) -> Result<Expr> {
        let _level = self.descend()?;
        // Each kind of node has a function of its own, and what a level does besides
        // recursing is in further functions, whose frames are gone when it recurses:
        // with one function for all of it a debug build spent 11 KB of stack per level.
        use ast::Expr as A;
        match e {
            A::Nested(inner) => self.bind_in(inner, calls),
            A::UnaryOp { op, expr } => self.unary(e, op, expr, calls),
            A::BinaryOp { left, op, right } => self.binary(e, left, op, right, calls),
            A::IsNull(x) => self.is_null(x, false, calls),
            A::IsNotNull(x) => self.is_null(x, true, calls),
            A::In {
                expr,
                target: ast::InTarget::List(list),
                negated,
                ..
            } => self.in_list(expr, list, *negated, calls),
            A::In { .. } | A::Subquery(_) | A::Exists { .. } => {
                unsupported("subqueries are not supported")
            }
            A::Between {
                expr,
                negated,
                low,
                high,
            } => self.between(expr, low, high, *negated, calls),
            A::Like {
                negated,
                any: false,
                expr,
                pattern,
                escape_char,
            }
            | A::ILike {
                negated,
                any: false,
                expr,
                pattern,
                escape_char,
            } => {
                let how = (*negated, matches!(e, A::ILike { .. }));
                self.like(expr, pattern, escape_char.as_deref(), how, calls)
            }
            A::Cast {
                expr, data_type, ..
            } => self.cast(e, expr, data_type, calls),
            A::Case {
                operand,
                conditions,
                else_result,
                ..
            } => self.case(
                operand.as_deref(),
                conditions,
                else_result.as_deref(),
                calls,
            ),
            A::Function(f) => self.function(f, calls),
            other => self.leaf(other),
        }
    }

    /// A node with no operands to bind.
    fn leaf(&self, e: &ast::Expr) -> Result<Expr> {
        use ast::Expr as A;
        match e {
            A::Identifier(id) => self.column(None, id),
            A::CompoundIdentifier(ids) => self.compound(ids),
            A::Value(v) => Ok(Expr::Literal(literal(&v.value).at(v.span.start)?)),
            A::TypedString(ts) => typed_string(e, ts),
            other => unsupported_expr(other),
        }
    }

    fn unary(
        &self,
        e: &ast::Expr,
        op: &ast::UnaryOperator,
        operand: &ast::Expr,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let op = unary_op(op)?;
        if let Some(literal) = negative_literal(e, op, operand) {
            return literal;
        }
        let operand = self.bind_in(operand, calls)?;
        Ok(Expr::Unary {
            op,
            expr: Box::new(operand),
        })
    }

    fn binary(
        &self,
        e: &ast::Expr,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let op = binary_op(op)?;
        let l = self.bind_in(left, calls.as_deref_mut())?;
        let r = self.bind_in(right, calls)?;
        Ok(self.binary_node(
            op,
            l,
            r,
            op_location(left, right).unwrap_or_else(|| e.span().start),
        ))
    }

    fn binary_node(&self, op: BinOp, mut l: Expr, mut r: Expr, at: Location) -> Expr {
        if op.is_comparison() {
            self.fit_literal(&l, &mut r);
            self.fit_literal(&r, &mut l);
        }
        Expr::Binary {
            op,
            left: Box::new(l),
            right: Box::new(r),
            at,
        }
    }

    fn is_null(
        &self,
        operand: &ast::Expr,
        negated: bool,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        Ok(Expr::IsNull {
            expr: Box::new(self.bind_in(operand, calls)?),
            negated,
        })
    }

    fn in_list(
        &self,
        operand: &ast::Expr,
        list: &[ast::Expr],
        negated: bool,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let target = self.bind_in(operand, calls.as_deref_mut())?;
        let mut items = Vec::new();
        for item in list {
            let mut b = self.bind_in(item, calls.as_deref_mut())?;
            self.fit_literal(&target, &mut b);
            items.push(b);
        }
        Ok(Expr::InList {
            expr: Box::new(target),
            list: items,
            negated,
        })
    }

    fn between(
        &self,
        operand: &ast::Expr,
        low: &ast::Expr,
        high: &ast::Expr,
        negated: bool,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let target = self.bind_in(operand, calls.as_deref_mut())?;
        let mut low = self.bind_in(low, calls.as_deref_mut())?;
        let mut high = self.bind_in(high, calls)?;
        self.fit_literal(&target, &mut low);
        self.fit_literal(&target, &mut high);
        Ok(Expr::Between {
            expr: Box::new(target),
            low: Box::new(low),
            high: Box::new(high),
            negated,
        })
    }

    /// `LIKE` or `ILIKE`; `how` is (NOT, case-insensitive).
    fn like(
        &self,
        operand: &ast::Expr,
        pattern: &ast::Expr,
        escape: Option<&ast::Expr>,
        (negated, case_insensitive): (bool, bool),
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let escape = match escape {
            None => None,
            Some(ast::Expr::Value(v)) => match &v.value {
                ast::Value::SingleQuotedString(s) if s.chars().count() == 1 => s.chars().next(),
                _ => {
                    return Err(Error::from(ErrorKind::InvalidStatement(
                        "ESCAPE must be a single character".into(),
                    ))
                    .or_at(v.span.start))
                }
            },
            Some(_) => return unsupported("ESCAPE must be a literal"),
        };
        Ok(Expr::Like {
            expr: Box::new(self.bind_in(operand, calls.as_deref_mut())?),
            pattern: Box::new(self.bind_in(pattern, calls)?),
            escape,
            negated,
            case_insensitive,
        })
    }

    fn cast(
        &self,
        e: &ast::Expr,
        operand: &ast::Expr,
        data_type: &ast::DataType,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let operand = self.bind_in(operand, calls)?;
        Ok(Expr::Cast {
            expr: Box::new(operand),
            to: map_type(data_type).at(e.span().start)?,
        })
    }

    fn case(
        &self,
        operand: Option<&ast::Expr>,
        conditions: &[ast::CaseWhen],
        else_result: Option<&ast::Expr>,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let operand = match operand {
            Some(o) => Some(Box::new(self.bind_in(o, calls.as_deref_mut())?)),
            None => None,
        };
        let mut whens = Vec::new();
        for cw in conditions {
            let when = self.bind_in(&cw.condition, calls.as_deref_mut())?;
            whens.push((when, self.bind_in(&cw.result, calls.as_deref_mut())?));
        }
        let otherwise = match else_result {
            Some(o) => Some(Box::new(self.bind_in(o, calls)?)),
            None => None,
        };
        Ok(Expr::Case {
            operand,
            whens,
            otherwise,
        })
    }

    /// When a comparison sets a column against a text literal, reads the literal as the
    /// column's type once, at plan time: `d = '2026-01-02'` compares dates, and a
    /// `CHAR(n)` column compares with the literal blank-padded, as Oracle does. A literal
    /// that does not fit stays as it is (the comparison then says why at run time).
    fn fit_literal(&self, column: &Expr, other: &mut Expr) {
        let (Expr::Column(i), Expr::Literal(v @ Value::Text(_))) = (column, &*other) else {
            return;
        };
        let Some(ty) = self.column_type(*i) else {
            return;
        };
        if matches!(ty, DataType::Varchar(_)) {
            return;
        }
        if let Ok(fitted) = coerce(v.clone(), &ty) {
            *other = Expr::Literal(fitted);
        }
    }

    fn column(
        &self,
        owner_and_table: Option<(Option<&Ident>, &Ident)>,
        id: &ast::Ident,
    ) -> Result<Expr> {
        let name = ident(id);
        let Some(scope) = &self.scope else {
            return Err(Error::from(ErrorKind::UndefinedColumn(format!(
                "column {name} does not exist (the statement reads no table)"
            )))
            .or_at(id.span.start));
        };
        if let Some((owner, q)) = owner_and_table {
            if !scope.answers_to(owner, q) {
                return Err(Error::from(ErrorKind::UndefinedTable(QualName::new(
                    owner.cloned(),
                    q.clone(),
                )))
                .or_at(id.span.start));
            }
        }
        match scope.table.column_index(&name) {
            Some(i) => Ok(Expr::Column(i)),
            None => Err(Error::from(ErrorKind::UndefinedColumn(format!(
                "column {name} of table {} does not exist",
                scope.table.name
            )))
            .or_at(id.span.start)),
        }
    }

    /// `t.c`, `owner.t.c`, `seq.NEXTVAL`, `owner.seq.CURRVAL`.
    fn compound(&self, ids: &[ast::Ident]) -> Result<Expr> {
        let names: Vec<Ident> = ids.iter().map(ident).collect();
        let last = names.last().map(|n| n.as_str().to_ascii_lowercase());
        let seq_op = match last.as_deref() {
            Some("nextval") => Some(SeqOp::NextVal),
            Some("currval") => Some(SeqOp::CurrVal),
            _ => None,
        };
        let (owner, q) = match names.as_slice() {
            [q, _] => (None, q),
            [o, q, _] => (Some(o), q),
            _ => {
                return unsupported(format!(
                    "name {} has too many parts",
                    ids.iter()
                        .map(|i| i.value.as_str())
                        .collect::<Vec<_>>()
                        .join(".")
                ))
            }
        };
        let is_table = self.scope.as_ref().is_some_and(|s| s.answers_to(owner, q));
        match seq_op {
            Some(op) if !is_table || self.column_is_missing(&names[names.len() - 1]) => {
                Ok(Expr::Sequence {
                    name: QualName::new(owner.cloned(), q.clone()),
                    op,
                })
            }
            _ => self.column(Some((owner, q)), &ids[ids.len() - 1]),
        }
    }

    fn column_is_missing(&self, name: &Ident) -> bool {
        self.scope
            .as_ref()
            .is_none_or(|s| s.table.column_index(name).is_none())
    }

    /// A function call. Its errors that point nowhere point at its name (not at the
    /// whole call, whose span would recurse through arguments not yet bound).
    fn function(&self, f: &ast::Function, mut calls: Option<&mut Vec<AggCall>>) -> Result<Expr> {
        let at = f.name.span().start;
        let parts = call_parts(f).at(at)?;
        if let Some(func) = aggregate_func(&parts.name) {
            return self.aggregate(func, &parts, calls).at(at);
        }
        let func = scalar_func(&parts.name).at(at)?;
        let mut args = Vec::with_capacity(parts.args.len());
        for a in &parts.args {
            let e = scalar_arg(a, &parts.name).at(at)?;
            args.push(self.bind_in(e, calls.as_deref_mut()).at(at)?);
        }
        check_arity(func, &parts.name, args.len()).at(at)?;
        Ok(Expr::Func { func, args })
    }

    /// An aggregate call: bound as the column its result will be in.
    fn aggregate(
        &self,
        func: AggFunc,
        parts: &CallParts<'_>,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let name = &parts.name;
        let Some(calls) = calls else {
            return Err(ErrorKind::Grouping(format!(
                "aggregate function {} is not allowed here",
                name.to_uppercase()
            ))
            .into());
        };
        let arg = match parts.args.as_slice() {
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]
                if func == AggFunc::Count && !parts.distinct =>
            {
                None
            }
            // Arguments of an aggregate may not hold another aggregate.
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e))] => Some(self.bind(e)?),
            _ => {
                return Err(ErrorKind::InvalidStatement(format!(
                    "{} takes one argument",
                    name.to_uppercase()
                ))
                .into())
            }
        };
        let call = AggCall {
            func,
            arg,
            distinct: parts.distinct,
        };
        let j = match calls.iter().position(|c| *c == call) {
            Some(j) => j,
            None => {
                calls.push(call);
                calls.len() - 1
            }
        };
        Ok(Expr::Column(AGG_BASE + j))
    }
}
