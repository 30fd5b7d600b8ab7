"""The built site read in a real browser (Debian's Chromium through Playwright), at 1400 px and at 420 px:
what tests/site_audit.py counts must be zero. Slow (the site's build, shared with the other site tests, and
two visits of every page: the longest file of the suite); it runs in ``make test`` and in CI, which install the
browser (``.ci/run``).

Locally: ``apt-get install chromium`` (or set KM_CHROMIUM to a Chromium or Chrome binary) and
``pip install playwright``; Playwright's own browser download is not used."""

from __future__ import annotations

import os

import pytest
import site_audit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def found(site_dir):
    pytest.importorskip("playwright", reason="pip install playwright (its browser download is not needed)")
    if site_audit.chromium_path() is None:
        if os.environ.get("REQUIRE_BROWSER") == "1":  # CI installs the browser: a missing one is a failure
            pytest.fail("REQUIRE_BROWSER=1 but no Chromium: apt-get install chromium, or set KM_CHROMIUM")
        pytest.skip("no Chromium: apt-get install chromium, or set KM_CHROMIUM")
    return site_audit.audit(site_dir)


def test_every_page_loads_from_this_site_alone(found):
    assert found["pages"] > 40
    assert not found["external_requests"], found["external_requests"][:10]


def test_every_page_loads_without_console_errors_or_failed_requests(found):
    assert not found["console_errors"], found["console_errors"][:10]
    assert not found["failed_requests"], found["failed_requests"][:10]


def test_the_last_top_tab_is_on_screen_at_1400px(found):
    assert not found["top_tabs_clipped"], found["top_tabs_clipped"][:5]


def test_no_paragraph_sits_inside_a_footnote(found):
    assert not found["footnotes_swallowing"], found["footnotes_swallowing"][:10]


def test_headline_tables_fit_the_column_at_1400px(found):
    assert found["tables"] > 100
    assert not found["headline_over_column"], found["headline_over_column"][:10]


def test_listings_do_not_scroll_sideways_at_1400px(found):
    assert found["listings"] > 300
    assert not found["listings_scrolling"], found["listings_scrolling"][:10]


def test_plot_legends_are_inside_their_figures(found):
    assert found["legends"] > 20
    assert not found["legends_clipped"], found["legends_clipped"][:10]


def test_maths_is_rendered(found):
    assert not found["raw_tex"], found["raw_tex"][:10]


def test_diagrams_are_rendered(found):
    assert not found["raw_mermaid"], found["raw_mermaid"][:10]


def test_each_bench_table_and_plot_is_on_its_page(found):
    assert not found["missing_bench"], found["missing_bench"]


def test_a_phone_never_scrolls_the_page_sideways(found):
    assert not found["phone_scroll"], found["phone_scroll"][:10]
    assert not found["phone_tables_scrolling"], found["phone_tables_scrolling"][:10]


def test_search_finds_transpose(found):
    assert found["search_transpose"] > 0


def test_content_tabs_switch(found):
    assert found["tabs_switch"] is True
