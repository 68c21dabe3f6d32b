// SPDX-License-Identifier: MIT
pragma solidity ^0.8.37;

/// @title PaygateUSDC
/// @notice A USDC-like ERC-20 (6 decimals) with EIP-3009 "transfer with authorization",
///         written from scratch for Paygate's local/dev chain. It mirrors the externally
///         visible behaviour of Circle's FiatTokenV2 that x402 relies on (EIP-712 domain
///         name "USD Coin", version "2", the same TYPEHASHes and checks); it has no
///         blacklist, pause or proxy. Minting is restricted to the owner (dev faucet).
contract PaygateUSDC {
    // ---------------------------------------------------------------- constants

    string public constant name = "USD Coin";
    string public constant symbol = "USDC";
    uint8 public constant decimals = 6;
    /// @notice EIP-712 domain version, as FiatTokenV2's version().
    string public constant version = "2";

    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    ); // 0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267
    bytes32 public constant RECEIVE_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    ); // 0xd099cc98ef71107a616c4f0f941f04c322d8e254fe26b3c6668db87aae413de8
    bytes32 public constant CANCEL_AUTHORIZATION_TYPEHASH = keccak256(
        "CancelAuthorization(address authorizer,bytes32 nonce)"
    ); // 0x158b0a9edf7a828aad02f63cd515c68ef2f50ba807396f6d12842833a1597429

    bytes32 private constant _EIP712_DOMAIN_TYPEHASH = keccak256(
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    );
    bytes32 private constant _NAME_HASH = keccak256(bytes(name));
    bytes32 private constant _VERSION_HASH = keccak256(bytes(version));

    /// @dev secp256k1n / 2: signatures with a larger s are malleable and rejected.
    uint256 private constant _HALF_CURVE_ORDER =
        0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    /// @dev ERC-1271 magic value: bytes4(keccak256("isValidSignature(bytes32,bytes)")).
    bytes4 private constant _ERC1271_MAGIC = 0x1626ba7e;

    // ---------------------------------------------------------------- storage

    uint256 public totalSupply;
    address public owner;
    mapping(address account => uint256) public balanceOf;
    mapping(address holder => mapping(address spender => uint256)) public allowance;
    mapping(address authorizer => mapping(bytes32 nonce => bool)) private _authorizationStates;

    uint256 private immutable _cachedChainId;
    address private immutable _cachedThis;
    bytes32 private immutable _cachedDomainSeparator;

    // ---------------------------------------------------------------- events

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce);
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);

    // ---------------------------------------------------------------- errors

    error NotOwner();
    error ZeroAddress();
    error InsufficientBalance();
    error InsufficientAllowance();
    error AuthorizationNotYetValid();
    error AuthorizationExpired();
    error AuthorizationAlreadyUsed();
    error InvalidSignature();
    error CallerMustBePayee();

    // ---------------------------------------------------------------- setup

    constructor(address initialOwner) {
        if (initialOwner == address(0)) revert ZeroAddress();
        owner = initialOwner;
        emit OwnershipTransferred(address(0), initialOwner);
        _cachedChainId = block.chainid;
        _cachedThis = address(this);
        _cachedDomainSeparator = _buildDomainSeparator();
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner();
        _;
    }

    function transferOwnership(address newOwner) external onlyOwner {
        if (newOwner == address(0)) revert ZeroAddress();
        emit OwnershipTransferred(owner, newOwner);
        owner = newOwner;
    }

    /// @notice Dev faucet: only the owner mints.
    function mint(address to, uint256 amount) external onlyOwner {
        if (to == address(0)) revert ZeroAddress();
        totalSupply += amount; // checked: overflow reverts
        unchecked {
            balanceOf[to] += amount; // bounded by totalSupply
        }
        emit Transfer(address(0), to, amount);
    }

    // ---------------------------------------------------------------- ERC-20

    function transfer(address to, uint256 value) external returns (bool) {
        _transfer(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        if (spender == address(0)) revert ZeroAddress();
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    /// @dev An allowance of type(uint256).max is treated as infinite and not decreased.
    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            if (allowed < value) revert InsufficientAllowance();
            unchecked {
                allowance[from][msg.sender] = allowed - value;
            }
        }
        _transfer(from, to, value);
        return true;
    }

    function _transfer(address from, address to, uint256 value) private {
        if (to == address(0)) revert ZeroAddress();
        uint256 fromBalance = balanceOf[from];
        if (fromBalance < value) revert InsufficientBalance();
        unchecked {
            balanceOf[from] = fromBalance - value;
            balanceOf[to] += value; // sum of balances == totalSupply, cannot overflow
        }
        emit Transfer(from, to, value);
    }

    // ---------------------------------------------------------------- EIP-712 / EIP-5267

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        if (block.chainid == _cachedChainId && address(this) == _cachedThis) {
            return _cachedDomainSeparator;
        }
        return _buildDomainSeparator();
    }

    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory name_,
            string memory version_,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", name, version, block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    function _buildDomainSeparator() private view returns (bytes32) {
        return keccak256(
            abi.encode(_EIP712_DOMAIN_TYPEHASH, _NAME_HASH, _VERSION_HASH, block.chainid, address(this))
        );
    }

    function _hashTypedData(bytes32 structHash) private view returns (bytes32 digest) {
        bytes32 domainSeparator = DOMAIN_SEPARATOR();
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            mstore(ptr, hex"1901")
            mstore(add(ptr, 0x02), domainSeparator)
            mstore(add(ptr, 0x22), structHash)
            digest := keccak256(ptr, 0x42)
        }
    }

    // ---------------------------------------------------------------- EIP-3009

    /// @notice Whether the nonce of this authorizer was used or canceled.
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool) {
        return _authorizationStates[authorizer][nonce];
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        bytes32 digest =
            _authorizationDigest(TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce);
        if (!_isValidSignature(from, digest, v, r, s)) revert InvalidSignature();
        _useAuthorization(from, nonce);
        _transfer(from, to, value);
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external {
        bytes32 digest =
            _authorizationDigest(TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce);
        if (!_isValidSignature(from, digest, signature)) revert InvalidSignature();
        _useAuthorization(from, nonce);
        _transfer(from, to, value);
    }

    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        if (to != msg.sender) revert CallerMustBePayee();
        bytes32 digest =
            _authorizationDigest(RECEIVE_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce);
        if (!_isValidSignature(from, digest, v, r, s)) revert InvalidSignature();
        _useAuthorization(from, nonce);
        _transfer(from, to, value);
    }

    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external {
        if (to != msg.sender) revert CallerMustBePayee();
        bytes32 digest =
            _authorizationDigest(RECEIVE_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce);
        if (!_isValidSignature(from, digest, signature)) revert InvalidSignature();
        _useAuthorization(from, nonce);
        _transfer(from, to, value);
    }

    function cancelAuthorization(address authorizer, bytes32 nonce, uint8 v, bytes32 r, bytes32 s) external {
        bytes32 digest = _cancelDigest(authorizer, nonce);
        if (!_isValidSignature(authorizer, digest, v, r, s)) revert InvalidSignature();
        _cancelAuthorization(authorizer, nonce);
    }

    function cancelAuthorization(address authorizer, bytes32 nonce, bytes calldata signature) external {
        bytes32 digest = _cancelDigest(authorizer, nonce);
        if (!_isValidSignature(authorizer, digest, signature)) revert InvalidSignature();
        _cancelAuthorization(authorizer, nonce);
    }

    function _authorizationDigest(
        bytes32 typeHash,
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce
    ) private view returns (bytes32) {
        if (block.timestamp <= validAfter) revert AuthorizationNotYetValid();
        if (block.timestamp >= validBefore) revert AuthorizationExpired();
        if (_authorizationStates[from][nonce]) revert AuthorizationAlreadyUsed();
        return _hashTypedData(keccak256(abi.encode(typeHash, from, to, value, validAfter, validBefore, nonce)));
    }

    function _cancelDigest(address authorizer, bytes32 nonce) private view returns (bytes32) {
        if (_authorizationStates[authorizer][nonce]) revert AuthorizationAlreadyUsed();
        return _hashTypedData(keccak256(abi.encode(CANCEL_AUTHORIZATION_TYPEHASH, authorizer, nonce)));
    }

    function _useAuthorization(address authorizer, bytes32 nonce) private {
        _authorizationStates[authorizer][nonce] = true;
        emit AuthorizationUsed(authorizer, nonce);
    }

    function _cancelAuthorization(address authorizer, bytes32 nonce) private {
        _authorizationStates[authorizer][nonce] = true;
        emit AuthorizationCanceled(authorizer, nonce);
    }

    // ---------------------------------------------------------------- signatures

    /// @dev ecrecover that returns address(0) for v not in {27, 28} or a high s.
    function _recover(bytes32 digest, uint8 v, bytes32 r, bytes32 s) private pure returns (address) {
        if (uint256(s) > _HALF_CURVE_ORDER || (v != 27 && v != 28)) return address(0);
        return ecrecover(digest, v, r, s);
    }

    /// @dev ECDSA first (cheap path for EOAs); ERC-1271 only when that fails and the
    ///      signer has code. The zero address never validates.
    function _isValidSignature(address signer, bytes32 digest, uint8 v, bytes32 r, bytes32 s)
        private
        view
        returns (bool)
    {
        if (signer == address(0)) return false;
        if (_recover(digest, v, r, s) == signer) return true;
        if (signer.code.length == 0) return false;
        return _isValidERC1271(signer, digest, abi.encodePacked(r, s, v));
    }

    /// @dev The bytes form: a 65-byte signature is r ‖ s ‖ v; anything else is only
    ///      accepted through ERC-1271.
    function _isValidSignature(address signer, bytes32 digest, bytes calldata signature)
        private
        view
        returns (bool)
    {
        if (signer == address(0)) return false;
        if (signature.length == 65) {
            bytes32 r;
            bytes32 s;
            uint8 v;
            assembly ("memory-safe") {
                r := calldataload(signature.offset)
                s := calldataload(add(signature.offset, 0x20))
                v := byte(0, calldataload(add(signature.offset, 0x40)))
            }
            if (_recover(digest, v, r, s) == signer) return true;
        }
        if (signer.code.length == 0) return false;
        return _isValidERC1271(signer, digest, signature);
    }

    function _isValidERC1271(address signer, bytes32 digest, bytes memory signature) private view returns (bool) {
        (bool ok, bytes memory ret) =
            signer.staticcall(abi.encodeWithSelector(_ERC1271_MAGIC, digest, signature));
        return ok && ret.length >= 32 && abi.decode(ret, (bytes32)) == bytes32(_ERC1271_MAGIC);
    }
}
