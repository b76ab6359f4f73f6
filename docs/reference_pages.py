"""MkDocs hook (mkdocs.yml `hooks:`): the two reference pages are generated at build time, so
neither can drift from the code.

- `reference/cli.md`: its `<!-- mxq:cli-reference -->` line becomes every command of the Typer
  app (`mxq.cli.main.app`, read as the command tree `typer.main.get_command` builds): usage, help
  text, arguments and options with their types and defaults.
- `reference/http.md`: its `<!-- mxq:http-reference -->` line becomes every route of the FastAPI
  app's OpenAPI document (`mxq.api.app.create_app().openapi()`): method, path, summary,
  description, parameters, request body and response codes, then the fields of each request body.

Both are read from the installed package (`make venv`), the way `mxq --help` and `/openapi.json`
read them.
"""

from __future__ import annotations

import json
import re
from typing import Any

CLI_MARKER = "<!-- mxq:cli-reference -->"
HTTP_MARKER = "<!-- mxq:http-reference -->"
METHODS = ("get", "post", "put", "patch", "delete")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if HTTP_MARKER in markdown:
        markdown = markdown.replace(HTTP_MARKER, http_reference())
    return markdown


def cell(text: object) -> str:
    """Text for a Markdown table cell: one line; outside code spans, pipes escaped and HTML-like
    brackets and stars shown as they are (a code span shows its text as it is already)."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(part if part.startswith("`") else _plain(part).replace("|", "\\|") for part in parts)


def _plain(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def prose(text: str | None) -> str:
    """A help text or description as Markdown paragraphs (a docstring's line breaks joined)."""
    if not text:
        return ""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join("".join(part if part.startswith("`") else _plain(part)
                                for part in re.split(r"(`[^`]*`)", p)) for p in paragraphs if p)


# ------------------------------------------------------------------------------------ the CLI


def cli_reference() -> str:
    import typer.main

    from mxq.cli.main import app

    root = typer.main.get_command(app)
    context = root.context_class(root, info_name="mxq")
    out: list[str] = []
    _command(root, context, "mxq", out)
    return "\n".join(out)


def _commands(command: Any, context: Any) -> list[tuple[str, Any]]:
    if not hasattr(command, "list_commands"):
        return []
    found = [(name, command.get_command(context, name)) for name in command.list_commands(context)]
    return [(name, sub) for name, sub in found if sub is not None and not sub.hidden]


def _command(command: Any, context: Any, path: str, out: list[str]) -> None:
    depth = min(path.count(" ") + 2, 4)
    out += [f"{'#' * depth} `{path}`", ""]
    usage = command.get_usage(context).removeprefix("Usage:").strip()
    out += ["```text", usage, "```", ""]
    if command.help:
        out += [prose(command.help), ""]
    rows = [_param(p, context) for p in command.get_params(context)
            if p.name != "help" and not getattr(p, "hidden", False)]
    if rows:
        out += ["| argument or option | type | default | description |",
                "| --- | --- | --- | --- |", *rows, ""]
    subcommands = _commands(command, context)
    if subcommands:
        out += ["| command | what it does |", "| --- | --- |"]
        out += [f"| [`{path} {name}`](#{_anchor(f'{path} {name}')}) | "
                f"{cell(sub.get_short_help_str(limit=300))} |" for name, sub in subcommands]
        out.append("")
        for name, sub in subcommands:
            _command(sub, sub.context_class(sub, info_name=name, parent=context), f"{path} {name}", out)


def _anchor(title: str) -> str:
    """The id MkDocs' toc extension gives a heading `` `mxq models add` ``."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


def _param(param: Any, context: Any) -> str:
    """One table row: the option's names (or the argument's), type, default and help, with the
    extras Click states beside the help (ranges, `required`)."""
    record = param.get_help_record(context)
    extras = ""
    if record:
        found = re.search(r"\s*\[([^\[\]]*)\]\s*$", record[1])
        extras = found.group(1) if found else ""
    default = ""
    notes = []
    for item in (i.strip() for i in extras.split(";") if i.strip()):
        if item.startswith("default: "):
            default = item.removeprefix("default: ")
        else:
            notes.append(item)
    is_flag = bool(getattr(param, "is_flag", False))
    if is_flag and not default:
        default = "off"
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if param.param_type_name == "argument":
        names = f"`{param.name.upper()}`"
    kind = "flag" if is_flag else param.display_type(context).strip("<>")
    text = " ".join(t for t in [param.help or "", *(f"[{n}]" for n in notes)] if t)
    return f"| {names} | {cell(kind)} | {cell(default) if default else ''} | {cell(text)} |"


# ----------------------------------------------------------------------------------- the API


def http_reference() -> str:
    from mxq.api.app import create_app

    document = create_app().openapi()
    out: list[str] = []
    for path, operations in document["paths"].items():
        for method in (m for m in METHODS if m in operations):
            _operation(method, path, operations[method], out)
    out += ["## Request bodies", "",
            "The fields of each request body, as the OpenAPI description types them "
            "(`GET /openapi.json` has every schema, answers included).", ""]
    schemas = document.get("components", {}).get("schemas", {})
    for name in sorted(_request_schemas(document)):
        _schema(name, schemas[name], out)
    return "\n".join(out)


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words: `integer`, `string (date-time)`, `ProbeJob`, `a or b`."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            kinds = [_type(s) for s in schema[union] if s.get("type") != "null"]
            kind = " or ".join(dict.fromkeys(kinds))
            return kind + (" or null" if any(s.get("type") == "null" for s in schema[union]) else "")
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if "format" in schema:
        kind += f" ({schema['format']})"
    return kind


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _bounds(schema: dict[str, Any]) -> str:
    """A schema's bounds in words: `1 to 64`, `length 1 to 128`, `> 0`, a short pattern."""
    found = [_bounds(sub) for union in ("anyOf", "oneOf") for sub in schema.get(union, [])]
    if "exclusiveMinimum" in schema:
        found.append(f"> {_number(schema['exclusiveMinimum'])}")
    if "exclusiveMaximum" in schema:
        found.append(f"< {_number(schema['exclusiveMaximum'])}")
    for low, high, prefix in (("minimum", "maximum", ""), ("minLength", "maxLength", "length ")):
        if low in schema and high in schema:
            found.append(f"{prefix}{_number(schema[low])} to {_number(schema[high])}")
        elif low in schema:
            found.append(f"{prefix}>= {_number(schema[low])}")
        elif high in schema:
            found.append(f"{prefix}<= {_number(schema[high])}")
    if "pattern" in schema:
        pattern = schema["pattern"]
        found.append(f"matches `{pattern}`" if len(pattern) <= 60 else "a pattern: see /openapi.json")
    return ", ".join(f for f in found if f)


def _operation(method: str, path: str, op: dict[str, Any], out: list[str]) -> None:
    out += [f"## `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}.**" + (" Needs the bearer token (`Authorization: Bearer "
                                           "$MXQ_API_TOKEN`) when the server has one set."
                                           if op.get("security") else ""), ""]
    if op.get("description"):
        out += [prose(op["description"]), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | default | description |",
                "| --- | --- | --- | --- | --- | --- |"]
        for p in params:
            schema = p.get("schema", {})
            text, default = _described(schema, p.get("description", ""))
            out.append(f"| `{p['name']}` | {p['in']} | {cell(_type(schema))} | "
                       f"{'yes' if p.get('required') else 'no'} | {default} | {cell(text)} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        schema = next(iter(body.get("content", {}).values()), {}).get("schema", {})
        names = _refs(schema)
        kinds = ", ".join(f"[`{n}`](#{n.lower()})" for n in names) or cell(_type(schema))
        out += [f"Request body ({'required' if body.get('required') else 'optional'}, JSON): "
                f"{kinds}.", ""]
    out += ["| answer | meaning | body |", "| --- | --- | --- |"]
    for status, answer in op.get("responses", {}).items():
        content = answer.get("content", {})
        media, shape = next(iter(content.items()), ("", {}))
        kind = _type(shape.get("schema", {})) if shape.get("schema") else ""
        what = f"`{media}`" + (f": {cell(kind)}" if kind else "") if media else "none"
        out.append(f"| {status} | {cell(answer.get('description', ''))} | {what} |")
    out.append("")


def _described(schema: dict[str, Any], description: str) -> tuple[str, str]:
    """A parameter's or field's description with its bounds, and its default as code (or "")."""
    bounds = _bounds(schema)
    text = " ".join(t for t in [description, f"({bounds})" if bounds else ""] if t)
    return text, f"`{json.dumps(schema['default'])}`" if "default" in schema else ""


def _refs(schema: dict[str, Any]) -> list[str]:
    if "$ref" in schema:
        return [schema["$ref"].rsplit("/", 1)[1]]
    return [r for union in ("anyOf", "oneOf") for s in schema.get(union, []) for r in _refs(s)]


def _request_schemas(document: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for operations in document["paths"].values():
        for op in operations.values():
            for media in op.get("requestBody", {}).get("content", {}).values():
                names.update(_refs(media.get("schema", {})))
    return names


def _schema(name: str, schema: dict[str, Any], out: list[str]) -> None:
    out += [f"### {name}", ""]
    if schema.get("description"):
        out += [prose(schema["description"]), ""]
    required = set(schema.get("required", []))
    out += ["| field | type | required | default | description |",
            "| --- | --- | --- | --- | --- |"]
    for field, spec in schema.get("properties", {}).items():
        text, default = _described(spec, spec.get("description", ""))
        out.append(f"| `{field}` | {cell(_type(spec))} | {'yes' if field in required else 'no'} | "
                   f"{default} | {cell(text)} |")
    out.append("")
