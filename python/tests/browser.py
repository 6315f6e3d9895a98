"""What a person sees of a page: Chromium renders it headless, and the
text it shows is read back in order."""

import shutil
import subprocess
from html.parser import HTMLParser


def visible_text(page_html, tmp_path):
    """The text Chromium shows of page_html, in order, scripts and styles
    left out."""
    browser = next(
        (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
        None,
    )
    # A page test that cannot render its page fails: it never passes
    # without looking (scripts/setup.sh browser installs Chromium).
    assert browser, "no chromium on this machine"
    tmp_path.mkdir(parents=True, exist_ok=True)
    page = tmp_path / "page.html"
    page.write_text(page_html, encoding="utf-8")
    o = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert o.returncode == 0, o.stderr

    class Text(HTMLParser):
        def __init__(self):
            super().__init__()
            self.parts, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            if tag in ("script", "style", "head", "template"):
                self.skip += 1

        def handle_endtag(self, tag):
            if tag in ("script", "style", "head", "template"):
                self.skip -= 1

        def handle_data(self, data):
            if not self.skip and data.strip():
                self.parts.append(" ".join(data.split()))

    reader = Text()
    reader.feed(o.stdout)
    return " ".join(reader.parts)
