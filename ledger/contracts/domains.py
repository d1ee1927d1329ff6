"""`DomainRegistry`: the domains pools are created under, and their parameter documents."""

from __future__ import annotations

from ledger.contracts.base import ContractBase, struct
from ledger.models import Domain, TxResult

_DOMAIN = "id name parameters_uri creator created_at"  # the struct getDomain returns


class DomainsContract(ContractBase):
    def create_domain(self, name: str, parameters_uri: str = "") -> int:
        result = self._tx(self.domains, "createDomain", name, parameters_uri)
        return self._created_id(result, "DomainCreated", "domainId")

    def get_domain(self, domain_id: int) -> Domain:
        return Domain(**struct(_DOMAIN, self._call(self.domains, "getDomain", domain_id)))

    def domain_count(self) -> int:
        return int(self._call(self.domains, "domainCount"))

    def update_domain_parameters(self, domain_id: int, parameters_uri: str) -> TxResult:
        return self._tx(self.domains, "updateParametersURI", domain_id, parameters_uri)
