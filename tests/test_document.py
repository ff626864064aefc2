"""The report's page, described once and rendered to HTML and to Markdown
(`analysis.reporting.document`): both say the same text, section by section."""
import html.parser
import re

import pytest

from analysis.reporting import document as d


class _Number:
  text = '0.5'

  def html(self):
    return '<span class="num" data-path="[&quot;a&quot;]">0.5</span>'


class _Text(html.parser.HTMLParser):
  """Each section's text (by id), and the classes of its paragraphs and cells."""

  def __init__(self):
    super().__init__()
    self.sections, self.classes, self.current = {}, [], None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag in ('section', 'nav'):
      self.current = attrs['id']
      self.sections[self.current] = ''
    if 'class' in attrs:
      self.classes.append((tag, attrs['class']))

  def handle_data(self, data):
    if self.current:
      self.sections[self.current] += data


PAGE = [
    d.Items([['a model | its size']], id='models'),
    d.Section('contents', 'Contents', [d.Items([[d.Link('Verdicts', '#verdicts')]],
                                                numbered=True)], 'nav'),
    d.Section('left-out', 'Left out', [d.Items([['hessian: too long; run ',
                                                 d.Code('python -m analysis hessian')]])]),
    d.Section('verdicts', 'Verdicts', [
        d.Paragraph(['How to read <this> & that.']),
        d.Table(['finding', 'verdict'], [[([d.Link('uniform', '#cka')], ''),
                                          (['agrees | mostly'], 'agrees')]])]),
    d.Section('cka', 'CKA', [
        d.Paragraph(['what is measured'], 'quantity'), d.Paragraph(['the paper'], 'paper'),
        d.Paragraph(['Numbers: ', d.Link('cka.json', 'cka.json')]),
        d.Figure('cka.png', 'a heat map [linear]', [['vit: ', _Number()], ['bit']])]),
]


def _markdown_sections(text):
  sections = {}
  for part in text.split('\n## ')[1:]:
    title, _, body = part.partition('\n')
    sections[title] = body
  return sections


def _plain(markdown):
  """Markdown's text without its markup."""
  markdown = re.sub(r'!\[[^\]]*\]\([^)]*\)', '', markdown)  # images: alt text is not text
  markdown = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', markdown)
  markdown = markdown.replace('\\|', '|')
  markdown = re.sub(r'^\|[-|]*\|$', '', markdown, flags=re.M)  # the header rule
  markdown = re.sub(r'^(- |1\. )', '', markdown, flags=re.M)
  return re.sub(r'[\s|*`]+', '', markdown)


def test_html_and_markdown_say_the_same_text_section_by_section():
  page = _Text()
  page.feed(d.to_html('Analysis of vit', PAGE, 'body{}'))
  markdown = d.to_markdown('Analysis of vit', PAGE)
  assert markdown.startswith('# Analysis of vit\n\n- a model | its size\n')
  titles = {'contents': 'Contents', 'left-out': 'Left out', 'verdicts': 'Verdicts', 'cka': 'CKA'}
  assert set(page.sections) == set(titles)
  by_title = _markdown_sections(markdown)
  for id_, title in titles.items():
    assert re.sub(r'[\s|]+', '', page.sections[id_]) == _plain(title + by_title[title]), id_
  assert ('p', 'quantity') in page.classes and ('td', 'agrees') in page.classes
  assert '<code>python -m analysis hessian</code>' in d.to_html('t', PAGE, '')
  assert 'run `python -m analysis hessian`' in markdown
  assert '| [uniform](#cka) | agrees \\| mostly |' in markdown  # a cell's bar escaped
  assert '*the paper*' in markdown and '![a heat map (linear)](cka.png)' in markdown
  assert 'How to read &lt;this&gt; &amp; that.' in d.to_html('t', PAGE, '')
  assert 'vit: 0.5  \nbit  \n' in markdown


def test_a_page_refuses_what_is_no_block():
  with pytest.raises(TypeError, match='Not a block of a page'):
    d.to_html('t', ['a string'], '')
  with pytest.raises(TypeError, match='Not a block of a page'):
    d.to_markdown('t', ['a string'])
