"""import-linter contract types of our own (``pyproject.toml``: ``contract_types``), run by ``make lint``.

``private_imports``: no module under ``source_modules`` except those under ``allowed_modules`` imports a private
name of an external package (``ray._private``, ``ray.train.v2._internal...``, ``ray._raylet``,
``mlflow.tracking._tracking_service``...). import-linter's own ``forbidden`` contract cannot say this: with
``include_external_packages`` the graph holds an external package as its top-level module only ("subpackages of
external packages are not valid"), so this contract reads each import's source line from the graph instead.
"""

from __future__ import annotations

import re

from importlinter import Contract, ContractCheck, fields, output


class PrivateImportsContract(Contract):
    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField())
    external_packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        names = "|".join(re.escape(p) for p in self.external_packages)
        private = re.compile(rf"\b(?:{names})(?:\.\w+)*\._\w+")
        sources = [str(m) for m in self.source_modules]
        allowed = tuple(str(m) for m in self.allowed_modules)
        found = []
        for module in sorted(graph.modules):
            if not module.startswith(tuple(sources)) or module == allowed or module.startswith(
                    tuple(f"{a}." for a in allowed)) or module in allowed:
                continue
            for imported in graph.find_modules_directly_imported_by(module):
                if imported.split(".")[0] not in self.external_packages:
                    continue
                for detail in graph.get_import_details(importer=module, imported=imported):
                    if private.search(detail["line_contents"]):
                        found.append((module, detail["line_number"], detail["line_contents"]))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, line, text in check.metadata["found"]:
            output.print_error(f"{module}:{line}: {text} (only {', '.join(self.allowed_modules)} may)")
            output.new_line()
