"""A page described once, as blocks, and rendered to HTML and to Markdown (the
analysis report: `analysis.cli.report.write_report`).

Text in a block is a sequence of inline parts: a string, a `Code` span, a `Link`,
or a quoted number (any object with `text`, its Markdown, and `html()`, its
tagged HTML, as `analysis.cli.report.Quote`).
"""
import dataclasses
import html
from typing import Any, List, Sequence, Tuple, Union

Inline = Any  # str, Code, Link or a quoted number
Text = Sequence[Inline]


@dataclasses.dataclass(frozen=True)
class Code:
  """Inline code: a command."""
  text: str


@dataclasses.dataclass(frozen=True)
class Link:
  """A link: its text and its target (a file beside the page, or '#' and a section)."""
  text: str
  href: str


@dataclasses.dataclass(frozen=True)
class Paragraph:
  """A paragraph; `kind` is its HTML class (a 'paper' paragraph is in italics)."""
  text: Text
  kind: str = ''


@dataclasses.dataclass(frozen=True)
class Items:
  """A bulleted (or numbered) list, one text per item."""
  items: Sequence[Text]
  numbered: bool = False
  id: str = ''  # the HTML list's id


@dataclasses.dataclass(frozen=True)
class Table:
  """A table: its column names and rows of cells, each cell a text and its HTML class."""
  columns: Sequence[str]
  rows: Sequence[Sequence[Tuple[Text, str]]]


@dataclasses.dataclass(frozen=True)
class Figure:
  """An image beside the page, its alt text and its captions (one line each)."""
  image: str
  alt: str
  captions: Sequence[Text]


@dataclasses.dataclass(frozen=True)
class Section:
  """A titled section, its id the anchor the contents link to; `tag` is its HTML
  element ('nav' for the contents)."""
  id: str
  title: str
  blocks: Sequence[Any]
  tag: str = 'section'


Block = Union[Paragraph, Items, Table, Figure, Section]


def _html_inline(text: Text) -> str:
  parts = []
  for part in text:
    if isinstance(part, str):
      parts.append(html.escape(part))
    elif isinstance(part, Code):
      parts.append(f'<code>{html.escape(part.text)}</code>')
    elif isinstance(part, Link):
      parts.append(f'<a href="{html.escape(part.href)}">{html.escape(part.text)}</a>')
    else:
      parts.append(part.html())
  return ''.join(parts)


def _markdown_inline(text: Text, in_table: bool = False) -> str:
  parts = []
  for part in text:
    if isinstance(part, str):
      parts.append(part)
    elif isinstance(part, Code):
      parts.append(f'`{part.text}`')
    elif isinstance(part, Link):
      parts.append(f'[{part.text}]({part.href})')
    else:
      parts.append(part.text)
  joined = ''.join(parts)
  return joined.replace('|', '\\|') if in_table else joined


def _html_cell(text: Text, kind: str) -> str:
  kind = f' class="{kind}"' if kind else ''
  return f'<td{kind}>{_html_inline(text)}</td>'


def _html_block(block: Block) -> List[str]:
  if isinstance(block, Section):
    lines = [f'<{block.tag} id="{block.id}"><h2>{html.escape(block.title)}</h2>']
    for inner in block.blocks:
      lines += _html_block(inner)
    return lines + [f'</{block.tag}>']
  if isinstance(block, Paragraph):
    kind = f' class="{block.kind}"' if block.kind else ''
    return [f'<p{kind}>{_html_inline(block.text)}</p>']
  if isinstance(block, Items):
    tag, id_ = 'ol' if block.numbered else 'ul', f' id="{block.id}"' if block.id else ''
    return [f'<{tag}{id_}>' + ''.join(f'<li>{_html_inline(item)}</li>' for item in block.items)
            + f'</{tag}>']
  if isinstance(block, Table):
    head = '<tr>' + ''.join(f'<th>{html.escape(c)}</th>' for c in block.columns) + '</tr>'
    rows = ''.join('<tr>' + ''.join(_html_cell(text, kind) for text, kind in row) + '</tr>'
                   for row in block.rows)
    return [f'<table>{head}{rows}</table>']
  if isinstance(block, Figure):
    return [f'<figure><img src="{html.escape(block.image)}" alt="{html.escape(block.alt)}">'
            '<figcaption>' + '<br>'.join(_html_inline(c) for c in block.captions) +
            '</figcaption></figure>']
  raise TypeError(f'Not a block of a page: {block!r}')


def _markdown_block(block: Block) -> List[str]:
  if isinstance(block, Section):
    lines = [f'## {block.title}', '']
    for inner in block.blocks:
      lines += _markdown_block(inner)
    return lines
  if isinstance(block, Paragraph):
    text = _markdown_inline(block.text)
    return [f'*{text}*' if block.kind == 'paper' else text, '']
  if isinstance(block, Items):
    mark = '1.' if block.numbered else '-'
    return [f'{mark} {_markdown_inline(item)}' for item in block.items] + ['']
  if isinstance(block, Table):
    return (['| ' + ' | '.join(block.columns) + ' |', '|' + '---|' * len(block.columns)] +
            ['| ' + ' | '.join(_markdown_inline(text, in_table=True) for text, _ in row) + ' |'
             for row in block.rows] + [''])
  if isinstance(block, Figure):
    alt = block.alt.replace('[', '(').replace(']', ')')
    return [f'![{alt}]({block.image})', '',
            *[_markdown_inline(c) + '  ' for c in block.captions], '']
  raise TypeError(f'Not a block of a page: {block!r}')


def to_html(title: str, blocks: Sequence[Block], style: str) -> str:
  """The page as HTML.

  Args:
    title: the page's title (its first heading).
    blocks: what it says, in order.
    style: its CSS.

  Returns:
    The HTML document, a line per block.
  """
  lines = [f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}'
           f'</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>']
  for block in blocks:
    lines += _html_block(block)
  return '\n'.join(lines + ['</body></html>']) + '\n'


def to_markdown(title: str, blocks: Sequence[Block]) -> str:
  """The page as Markdown: the same text, a section per `## ` heading.

  Args:
    title: the page's title (its first heading).
    blocks: what it says, in order.

  Returns:
    The Markdown document.
  """
  lines = [f'# {title}', '']
  for block in blocks:
    lines += _markdown_block(block)
  return '\n'.join(lines) + '\n'
