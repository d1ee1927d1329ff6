// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title DomainRegistry
/// @notice Domains are categories of RL work (e.g. "math-rollouts"); pools are created inside one.
/// Only the federator role creates or edits them. Ids start at 1 so that 0 means "none".
contract DomainRegistry is AccessControl {
    bytes32 public constant FEDERATOR_ROLE = keccak256("FEDERATOR_ROLE");

    struct Domain {
        uint256 id;
        string name;
        string parametersURI;
        address creator;
        uint64 createdAt;
    }

    mapping(uint256 => Domain) private _domains;
    uint256 public domainCount;

    event DomainCreated(uint256 indexed domainId, string name, string parametersURI, address indexed creator);
    event DomainParametersUpdated(uint256 indexed domainId, string parametersURI);

    error EmptyDomainName();
    error DomainNotFound(uint256 domainId);
    error ZeroAddress();

    constructor(address admin) {
        if (admin == address(0)) revert ZeroAddress();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(FEDERATOR_ROLE, admin);
    }

    function createDomain(string calldata name, string calldata parametersURI)
        external
        onlyRole(FEDERATOR_ROLE)
        returns (uint256 domainId)
    {
        if (bytes(name).length == 0) revert EmptyDomainName();
        domainId = ++domainCount;
        _domains[domainId] = Domain(domainId, name, parametersURI, msg.sender, uint64(block.timestamp));
        emit DomainCreated(domainId, name, parametersURI, msg.sender);
    }

    function updateParametersURI(uint256 domainId, string calldata parametersURI)
        external
        onlyRole(FEDERATOR_ROLE)
    {
        if (!domainExists(domainId)) revert DomainNotFound(domainId);
        _domains[domainId].parametersURI = parametersURI;
        emit DomainParametersUpdated(domainId, parametersURI);
    }

    function domainExists(uint256 domainId) public view returns (bool) {
        return domainId != 0 && domainId <= domainCount;
    }

    function getDomain(uint256 domainId) external view returns (Domain memory) {
        if (!domainExists(domainId)) revert DomainNotFound(domainId);
        return _domains[domainId];
    }
}
